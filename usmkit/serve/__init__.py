"""Streaming recognition as a service: ``usmkit-serve``, a WebSocket server speaking WeNet's protocol
(``protocol``), which runs the chunks of all connected streams as batched encoder steps (``batcher``,
``session``), and serves a browser page that streams the microphone (``page/``). ``server`` is the
command line and the connection handling; ``docs/serve.md`` the user's guide.
"""
