"""Agents as services: the Model Context Protocol client and server, the Agent2Agent server and
client, and skills (the registry that both protocols publish)."""
