"""Bring the whole Meridian stack up on one machine: the run command's service layer."""
