"""The backends of :class:`agentrl.Sandbox` other than the native one (``agentrl._core``):
``backend="nsjail"`` is :mod:`agentrl.backends.nsjail`."""
