"""The environment variables the PostgreSQL engine reads (tilewise.envvars): its SPEC lists them, so
`engines list` gives a bad value as the reason PostgreSQL cannot run."""

from __future__ import annotations

from tilewise import envvars
from tilewise.envvars import Var

PORT = Var("TILEWISE_POSTGRES_PORT", envvars.port(1024), "a port number (1024-65535)",
           "set it to the first instance's port, or unset it (tilewise picks free ports)")
DIR = Var("TILEWISE_POSTGRES_DIR", envvars.directory, "a directory",
          "set it to a directory the server's user can write, or unset it (/tmp)")
JIT = Var("TILEWISE_POSTGRES_JIT", envvars.choice("on", "off"), "on or off", "unset it for the measured default")
BIN = Var("TILEWISE_POSTGRES_BIN", envvars.directory, "a directory",
          "point it at the server's bin directory (e.g. /usr/lib/postgresql/15/bin) or unset it")
USER = Var("TILEWISE_POSTGRES_USER", envvars.text, "a user name", "set it to an existing unprivileged user")

ALL = (PORT, DIR, JIT, BIN, USER)
