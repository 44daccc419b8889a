"""One error hierarchy. Only the CLI's entry point turns these into exit codes (as click does)."""

import click


class EaglelabError(click.ClickException):
    """Base of every error a user can act on: the message names the file/key/host and the fix."""

    exit_code = 2


class ConfigError(EaglelabError):
    """conf/*.yaml is missing, unparsable or invalid. `public`: the message as the status page may
    show it (file, key, line; no value that could be a secret); the full one is for the terminal."""

    def __init__(self, message: str, public: str | None = None):
        super().__init__(message)
        self.public = public if public is not None else message


class RegistryError(EaglelabError):
    """The run registry could not be read or written."""


class HostError(EaglelabError):
    """A host could not be reached or refused a command."""


class StageError(EaglelabError):
    """A stage cannot start (bad inputs, failed preflight) or ended badly."""

    exit_code = 1
