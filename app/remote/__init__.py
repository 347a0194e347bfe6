"""Models served elsewhere: saved connections to OpenAI-compatible servers (an MTP Chat
server or any other), the chat's reply source for them, and the cluster dialog."""
