"""What the report says: the paper's reported numbers (`paper`, `paper.yaml`), the verdict's one rule (`verdict`), the
pooling across models (`pooling`), the report's content gathered from the data (`content`) and the explorer's data
(`explorer`). It reads the run through meaningless_tokens/results/ and renders from templates/."""
