"""qola's output stage (CONTRIBUTING.md: what it holds, what it may import)."""
