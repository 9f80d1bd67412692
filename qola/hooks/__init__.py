"""qola's hooks stage (CONTRIBUTING.md: what it holds, what it may import)."""
