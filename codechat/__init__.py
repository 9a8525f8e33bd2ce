"""codechat: train your own code-chat language model end to end."""
__version__ = "0.1.0"
