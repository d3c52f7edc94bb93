"""What the benchmarks (``bench/``) and the studies (``experiments/``) share, outside the library.

- ``tools.results``: the head of a result's JSON (command, device, date, torch) and where results go;
- ``tools.repeats``: a measurement run several times, reported as median, min and max;
- ``tools.phase_timer``: wall time per phase of a loop, measured in process;
- ``tools.train_runs``: the trainer's config for a run in the caller's process, and a run's last step.

Neither folder imports the other: both import this package (run from the repository root with
``PYTHONPATH=.``). usmkit never imports it.
"""
