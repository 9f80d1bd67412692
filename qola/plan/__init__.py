"""qola's plan stage (CONTRIBUTING.md: what it holds, what it may import)."""
