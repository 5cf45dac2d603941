"""The judge: the rating prompt and the in-process judge (:mod:`mmw.judge.judge`), where judgements come from
(:mod:`mmw.judge.backends`), and the well-formedness of OpenAI-compatible replies (:mod:`mmw.judge.openai_replies`)."""
