"""The one error type for bad input from a user: the message names the problem and the fix.

It lives in the bottom layer so every component can raise it; the ``spotmorph`` command turns it
into one line on stderr and exit code 2, never a traceback.
"""


class UserInputError(ValueError):
    """Bad input from a user (a file, a flag, a spec); ``str(err)`` is the whole explanation."""
