"""Evaluation: run model-written code safely, score it, and measure a model on benchmark suites.

:mod:`.sandbox` runs programs against tests in isolation; :mod:`.rewards` turns its results (and
function calls) into RL rewards; :mod:`.passk` computes pass@k, the pre-RL verdict and the
pass-rate filter; :mod:`.extract` finds the code in a chat answer; :mod:`.problems` loads HumanEval
(shipped in ``data/``) and MBPP; :mod:`.suites` samples and judges a suite; :mod:`.funcall` scores
function calling turn by turn; :mod:`.cli` is ``codechat eval``.
Imports point one way: ``cli -> suites -> problems -> extract`` (and ``funcall -> suites`` for the
``run.json`` guard), and everything that runs code goes through :mod:`.sandbox`, which imports
nothing else of codechat.
"""
