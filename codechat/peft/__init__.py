"""Parameter-efficient fine-tuning: LoRA adapters on a frozen base (:mod:`codechat.peft.lora`).

A leaf below the checkpoint code and the engine (it imports only :mod:`codechat.config`): the trainer
attaches adapters, :func:`codechat.checkpoint.load_model` merges them at load, the engine reads merged
weights, and :mod:`codechat.hf.peft` writes them in PEFT's format.
"""
