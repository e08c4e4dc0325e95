"""Conversation history and app settings, stored in SQLite under the
library's home folder. No Qt and no MLX here."""
