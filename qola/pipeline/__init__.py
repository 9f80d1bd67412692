"""qola's pipeline stage (CONTRIBUTING.md: what it holds, what it may import)."""
