"""qola's core stage (CONTRIBUTING.md: what it holds, what it may import)."""
