"""Generated from the live CLI by `python -m scripts.generate`: do not edit."""
