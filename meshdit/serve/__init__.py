"""`meshdit serve`: an OpenAI-compatible image API over a resident mesh of ranks."""
