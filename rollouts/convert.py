"""Placeholder: being written."""


def add_parser(sub):
    pass
