"""Custom ops. One folder per op: reference.py (eager oracle), triton.py, api.py (autograd + dispatch)."""
