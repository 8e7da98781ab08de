"""The TUI's screens: chat, models, dashboard (the app's modes), help and dialogs."""
