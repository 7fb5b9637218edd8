#!/usr/bin/env bash
# Builds kube-scheduler once into ~/.cache/ferrox/bin (see setup-component.sh).
exec bash "$(dirname "$0")/setup-component.sh" kube-scheduler
