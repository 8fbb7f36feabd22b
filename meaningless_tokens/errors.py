"""Every exception the project raises, in one place.

A `StageError` is bad input a stage reports as one `error: ...` line naming the file and key, with exit status 2
(meaningless_tokens/cli.py); the others are internal signals or the verify/lock tools' own errors.

Code that reads one params section, not the whole params, raises a `BadParam` with the key alone; the stage it runs in
(`names_the_file` around every stage's `run`) puts the params file in front, the one place that holds it.
"""

import functools


class StageError(Exception):
    """Bad input a stage reports as one `error: ...` line and exit status 2."""


class ConfigError(StageError):
    """A params value is wrong; the message names file, key, value and what is allowed."""


class BadParam(ConfigError):
    """A params value is wrong, found by code that holds the key's section but not the params file: the message starts
    with the key, and reads `<file>: <key>: ...` like every ConfigError's once the stage has set `file`
    (`names_the_file`)."""

    file = None  # the params file the value came from; None until the stage sets it

    def __str__(self) -> str:
        return str(self.args[0]) if self.file is None else f"{self.file}: {self.args[0]}"


def names_the_file(run):
    """A stage's `run(params, ...)`: a BadParam raised in it gets `params.file`, so its line names the file and key."""
    @functools.wraps(run)
    def named(params, *args, **kwargs):
        try:
            return run(params, *args, **kwargs)
        except BadParam as e:
            if e.file is None:
                e.file = params.file
            raise
    return named


class UnlistedParam(StageError):
    """A stage read a params key that dvc.yaml does not list for it: a change to that key would not rerun the stage."""


class DatasetError(StageError):
    """The dataset file is missing, altered or malformed; the message names the file."""


class PromptError(StageError):
    """A prompt cannot be built as configured (no chat template, span text too short, ...)."""


class ModelSourceError(StageError):
    """A model source cannot be resolved; the message is one line naming the model and the cause."""


class UnsupportedModel(StageError):
    """The model is not a decoder-only causal LM whose attention the capture can record; one line
    naming the params file, the model, its model_type and the reason."""


class OutputError(StageError):
    """A file cannot be written or read back (disk full, read-only or missing folder, permission denied):
    one line naming the file and the reason."""


class ArtifactError(StageError):
    """An artifact a stage reads is missing, corrupt, truncated or of another format; names the file."""


class NonFiniteError(ArtifactError):
    """NaN or infinity in a value about to be written: a wrong number is worse than no number."""


class CaptureError(Exception):
    """The model's attention cannot be captured this way; the message is the reason."""


class StopForward(Exception):
    """Raised after the last requested layer: the rest of the model is not run."""


class LockError(Exception):
    """A lock is missing or malformed; names the file (and line)."""


class VerifyError(Exception):
    """Bad input (a revision that does not exist, no dvc.lock): one line, exit status 2."""


class Differs(Exception):
    """The first difference beyond tolerance found in a file: where, and both values."""


class Beyond(Differs):
    """A value beyond its tolerance where the two files are otherwise alike (the same objects, keys, shapes and
    dtypes; a page's text the same but for its numbers): beyond float noise, and judged by the conclusions."""
