"""qola's compile stage (CONTRIBUTING.md: what it holds, what it may import)."""
