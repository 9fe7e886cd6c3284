"""The environment variables the Trino engine reads (tilewise.envvars): its SPEC lists them, so
`engines list` gives a bad value as the reason Trino cannot run."""

from __future__ import annotations

import re

from tilewise import envvars
from tilewise.envvars import Var


def _release(text: str) -> str:
    if not re.fullmatch(r"\d{3,4}", text.strip()):
        raise ValueError("is not a Trino release number")
    return text.strip()


def _url(text: str) -> str:
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text.strip()):
        raise ValueError("is not an http(s) URL")
    return text.strip().rstrip("/")


START_TIMEOUT = Var("TILEWISE_TRINO_START_TIMEOUT", envvars.seconds, "a positive number of seconds", "e.g. 600")
VERSION = Var("TILEWISE_TRINO_VERSION", _release, "a Trino release number", "use e.g. 476, or unset it")
MIRROR = Var("TILEWISE_MAVEN_MIRROR", _url, "a Maven mirror's URL",
             "set it to a reachable Maven mirror, e.g. https://repo1.maven.org/maven2, or unset it")
HOME = Var("TILEWISE_TRINO_HOME", envvars.directory, "a directory",
           "set it to a writable directory for Trino's server, or unset it")
JAVA_HOME = Var("TILEWISE_TRINO_JAVA_HOME", envvars.directory, "a directory", "point it at a Java 22+ home, or unset it")

ALL = (START_TIMEOUT, VERSION, MIRROR, HOME, JAVA_HOME)
