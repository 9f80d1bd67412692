"""Helpers shared by the tests (no tests here); test files import them as support.<module>."""
