"""The night's machinery, which flows/nightly.py (and flows/smoke.py) compose: its clock and
budgets (clock.py), the phase records
(phases.py), the fleet of nodes and their teardown (fleet.py), the stages of the night
(stages.py), phase 2b's turns (training.py), the reaper's policy (reaper.py) and the training
job's hand-off to the node (handoff.py). The slots that say who owns the node are
tasks/shared/slots.py, which training shares."""
