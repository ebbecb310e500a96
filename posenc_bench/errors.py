"""Named errors. Library code raises these; the CLI turns each into one line and exit code 2."""


class PosencError(Exception):
    """Base class for every error posenc-bench raises on bad input."""


class ConfigError(PosencError, ValueError):
    """A config key or value is invalid; the message names the value and the valid choices."""


class UnknownEncodingError(ConfigError, KeyError):
    """An encoding name that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DataError(PosencError):
    """A corpus source cannot be read or is too small for the requested run."""


class PositionOutOfRange(PosencError):
    """An encoding was asked for positions it cannot represent (e.g. a learned table past its length).

    The sweep records such a cell as ``status: "n/a"`` with this message as the reason.
    """
