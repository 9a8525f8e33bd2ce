"""``codechat speedrun``: a trained code-chat model from a fresh machine in one command.

:mod:`.plan` decides the stages and each one's share of the time budget from measured times,
:mod:`.rl_choice` whether the RL stage runs, :mod:`.run` runs them in order, :mod:`.baselines` measures
gzip and xz on the validation split, :mod:`.report` writes the report card (plots, ``report.md``).
"""
