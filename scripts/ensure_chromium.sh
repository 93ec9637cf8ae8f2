#!/usr/bin/env bash
# Installs Debian's headless Chromium for the report's browser test when it
# is missing and we may install packages (root). Never fatal: without it the
# browser test is skipped with a message that says so.
if [[ -x /usr/bin/chromium ]]; then exit 0; fi
if [[ "$(id -u)" != "0" ]] || ! command -v apt-get >/dev/null; then
  echo "[peat] /usr/bin/chromium missing and cannot apt-get: the report browser test will be skipped" >&2
  exit 0
fi
echo "[peat] installing Debian chromium for the report browser test" >&2
( apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium ) >/tmp/peat_chromium_install.log 2>&1 \
  || echo "[peat] chromium install failed (see /tmp/peat_chromium_install.log): the browser test will be skipped" >&2
exit 0
