"""The node image's model folder (`slm-nightly node prepare-weights`): where each piece goes
(layout.py), building it from a source (weights.py), checking it (checks.py), and the command
(cli.py). Run once when the image is built, never at boot; it reads a profile, so it sits above
the domains, beside tasks/profile.py."""
