"""What the report says and how it knows it: numbers traced to their files (`trace`), the stock phrases of the
charts' explanations (`phrases`), the paper's reported numbers (`paper`, `paper.yaml`), the verdict's one rule
(`verdict`), the pooling across models (`pooling`) and the report's content gathered from the data (`content`).
The chart kinds draw and explain in `charts/`; the report and results pages are rendered from `templates/`.

Nothing is imported here: `charts` imports `report.trace` and `report.phrases`, and `report.verdict` and
`report.paper` read the charts' `Context`, so an import of this package must not pull in the verdict.
"""
