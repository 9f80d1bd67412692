"""qola's store stage (CONTRIBUTING.md: what it holds, what it may import)."""
