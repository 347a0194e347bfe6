"""Models on the Hub and on disk: client, search, download, pull, store, inspection."""
