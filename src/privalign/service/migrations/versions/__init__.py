"""Revision scripts (see :mod:`privalign.service.migrations`)."""
