"""What the pipelines under ``recipes/`` share: running their ``python -m usmkit.cli.*`` commands as resumable
steps (``steps``) and handing one run's results to another (``handoff``). It sits above the command line: it
runs the commands, it does not import them."""
