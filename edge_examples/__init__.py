"""Runnable examples built on the library (LAN chat, game, sensor node, telemetry)."""
