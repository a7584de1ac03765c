"""The musubi-tuner adapter (kohya-ss musubi-tuner: Wan, HunyuanVideo, FramePack, Qwen-Image, FLUX.2 ...),
a variant of the sd-scripts adapter: ``profile`` is what musubi is (its scripts, flags and the
``Dialect`` the shared kohya modules read), ``adapter`` its contract side (resume arguments, output
names, the start-up summary), ``output`` its lines, ``remedies`` its memory ladder in its own flags,
``doctor`` its preflight checks. Everything musubi shares with sd-scripts (plans, states, saves,
samples, prompt files) is ``adapters.kohya``'s, told the dialect.
"""
