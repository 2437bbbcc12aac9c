"""Pure domain of scalebench: specs, matrix expansion, scaling math, regression detection.

Imports only the standard library and pydantic (enforced by tests/test_imports.py).
"""
