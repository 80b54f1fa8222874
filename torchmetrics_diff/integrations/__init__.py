"""Adapters to training frameworks. Each module imports its framework; nothing else in the package imports them."""
