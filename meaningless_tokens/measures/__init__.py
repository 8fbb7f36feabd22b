"""What each model stage measures: one module per dvc.yaml stage, named like the stage and its params section
(stages/<name>.py runs meaningless_tokens/measures/<name>.py on the params section <name>). A module here returns
plain results; the stage writes them. Nothing is imported here, so a stage loads only its own measure."""
