"""The rehearsal: every planned command runs in an isolated root before anything is submitted.

One package, so a newcomer finds it by its name:

- ``result.py``  (pure) what a rehearsal ended with; the ``RehearsalResult`` a planned target carries.
- ``model.py``   (pure, no I/O) what a run is given (env with credential placeholders, the task's Iris
  variables) and what its records mean (the failing line, every difference from the plan).
- ``runner.py``  (I/O) the isolated root itself: bwrap, the bundle at ``/app``, the stand-ins, the verdict.
- ``task_image.py`` (I/O) the planned task image's userland, pulled and unpacked once per manifest digest.
- ``standins/``   the stand-ins for the network tools (ship with the service; the runner puts them on PATH).

Nothing is imported here, so ``domain/`` may import the pure modules without loading the runner.
"""
