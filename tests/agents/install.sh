#!/usr/bin/env bash
# Installs the pinned coding agents for tests/agents/ into a cache outside the repo:
# Claude Code, Codex CLI and OpenCode from npm, aider into its own venv. Quick when the cache
# already holds these versions (a stamp file per pin). Never fatal unless CI=true: without an
# agent, its test is skipped with the reason this script leaves in $CACHE/<agent>.missing.
set -u
CACHE="${AGENTS_CACHE:-$HOME/.cache/crossbar-agents}"
NPM_PINS="@anthropic-ai/claude-code@2.1.328 @openai/codex@0.169.0 opencode-ai@1.18.33"
AIDER_PIN="aider-chat==0.86.2"
PY="${PY:-python3}"
mkdir -p "$CACHE"
start=$(date +%s)
failed=0

if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "installing nodejs and npm for the agent tests"
	(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm) \
		>"$CACHE/apt.log" 2>&1 || echo "could not install nodejs/npm (see $CACHE/apt.log)"
fi

npm_stamp="$CACHE/npm-$(echo "$NPM_PINS" | sed 's|[ /@]|_|g').stamp"
if [ ! -f "$npm_stamp" ]; then
	if ! command -v npm >/dev/null 2>&1; then
		echo "no node/npm" >"$CACHE/npm.missing"; failed=1
	else
		echo "installing $NPM_PINS into $CACHE"
		[ -f "$CACHE/package.json" ] || echo '{"private": true}' >"$CACHE/package.json"
		if (cd "$CACHE" && npm install --silent --no-audit --no-fund $NPM_PINS) >"$CACHE/npm.log" 2>&1; then
			rm -f "$CACHE"/npm-*.stamp "$CACHE/npm.missing"; touch "$npm_stamp"
		else
			echo "npm install failed: $(tail -n 3 "$CACHE/npm.log" | tr '\n' ' ')" >"$CACHE/npm.missing"
			failed=1
		fi
	fi
fi

aider_stamp="$CACHE/aider-$AIDER_PIN.stamp"
if [ ! -f "$aider_stamp" ]; then
	echo "installing $AIDER_PIN into $CACHE/aider"
	if "$PY" -m venv "$CACHE/aider" >"$CACHE/aider.log" 2>&1 \
		&& "$CACHE/aider/bin/pip" install -q --disable-pip-version-check "$AIDER_PIN" >>"$CACHE/aider.log" 2>&1; then
		rm -f "$CACHE"/aider-*.stamp "$CACHE/aider.missing"; touch "$aider_stamp"
	else
		echo "pip install $AIDER_PIN failed: $(tail -n 3 "$CACHE/aider.log" | tr '\n' ' ')" >"$CACHE/aider.missing"
		failed=1
	fi
fi

took=$(( $(date +%s) - start ))
[ "$took" -gt 2 ] && echo "agents ready in $CACHE ($took s)"
if [ "$failed" = 1 ]; then
	cat "$CACHE"/*.missing 2>/dev/null
	[ "${CI:-}" = true ] && exit 1
fi
exit 0
