"""Supervised fine-tuning: demonstrations (`data`), the update (`step`), thinking and
non-thinking traces (`traces`, `fusion`). Import each name from its module."""
