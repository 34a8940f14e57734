#!/bin/bash
# Part 5 of s12.sh (its own run_all stage, so its logs come back even if a later part is cut short).
exec bash "$(dirname "$0")/s12.sh" 5
