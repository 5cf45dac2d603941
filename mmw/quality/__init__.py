"""Secondary quality measures (docs/VALIDATION.md): repetition, perplexity under a scoring model, MAUVE between
baseline and watermarked texts, and the task measures of the validation tasks (pass@1 in the sandbox, accuracy).

Submodules are imported where used: :mod:`~mmw.quality.repetition` and :mod:`~mmw.quality.task_measures` are
light (no torch); :mod:`~mmw.quality.scoring` loads a model; :mod:`~mmw.quality.mauve` needs ``mauve-text``.
"""
