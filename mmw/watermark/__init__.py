"""The watermark: a scheme (randomness source + sampler + score), its processor and its detector, and outside
watermarks as plugins. The front door is :mod:`mmw.watermark.build` (``build_processor``, ``build_detector``)."""
