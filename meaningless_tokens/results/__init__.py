"""What the charts and the report both read, below both: the run's artifacts loaded once (`context`, `load`), views of
them (`activations`), numbers traced to their files (`trace`), and the words around numbers (`phrases`, `prose`).
Imports only from the layers below it, never from charts or report (tests/test_store.py checks it)."""
