"""The engine core the chat, the server and the CLI share: the scheduler and what carries
from one reply to the next."""
