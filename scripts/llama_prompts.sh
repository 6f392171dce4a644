#!/usr/bin/env bash
# Writes the prompt files of the llama.cpp accuracy runs (docs/lab/accuracy-log.md, "Through llama.cpp")
# into a directory and checks each file's sha256, so a run elsewhere uses the same bytes.
# All come from files every Debian 12 (bookworm) system has; nothing is downloaded.
#
#   scripts/llama_prompts.sh [DIR]      # default ${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}/prompts
#
#   gpl3.txt        /usr/share/common-licenses/GPL-3 (base-files): natural text, 7,486 tokens
#                   with Qwen2.5's tokenizer, 7,563 with Gemma 3's
#   code.py         /usr/lib/python3.11/dataclasses.py (libpython3.11-stdlib 3.11.2-6+deb12u6,
#                   unmodified: it matches dpkg's md5sums): real source code, 13,678 Qwen2.5 tokens
#   licences.txt    GPL-3 then Apache-2.0, concatenated as they are: 9,759 Qwen2.5 tokens, for
#                   N = 8,192 (GPL-3 alone is too short and lab/llama_migrate.py repeats no text)
#   licences-all.txt  every licence text of base-files, GPL-3 and Apache-2.0 first (so its first
#                   tokens are licences.txt's), then GPL-2, LGPL-2.1, LGPL-2, LGPL-3, MPL-2.0,
#                   MPL-1.1, GFDL-1.3, GFDL-1.2, GPL-1, Artistic, CC0-1.0, BSD: 237,320 bytes of
#                   natural text, for N = 32,768
#
# Prints one "NAME PATH" line per file. A source whose bytes differ (another Debian release or
# Python build) is an error naming the sha256 found: the measured figures are for these bytes.
set -euo pipefail

dir="${1:-${TQKV_CACHE_DIR:-${HOME}/.cache/tqkv}/prompts}"
mkdir -p "${dir}"
die() { echo "llama_prompts: $*" >&2; exit 1; }

make_prompt() {  # NAME SHA256 SOURCE...
  local name="$1" want="$2" got
  shift 2
  for src in "$@"; do [[ -f "${src}" ]] || die "${src}: not found (a Debian 12 file)"; done
  cat "$@" > "${dir}/${name}.part"
  got="$(sha256sum "${dir}/${name}.part" | cut -d' ' -f1)"
  if [[ "${got}" != "${want}" ]]; then
    rm -f "${dir}/${name}.part"
    die "${name} from $*: sha256 ${got}, expected ${want}"
  fi
  mv "${dir}/${name}.part" "${dir}/${name}"
  echo "${name} ${dir}/${name}"
}

readonly GPL3=/usr/share/common-licenses/GPL-3
readonly APACHE2=/usr/share/common-licenses/Apache-2.0
make_prompt gpl3.txt 3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986 "${GPL3}"
make_prompt code.py 2b43fbb6faa846bd01d682911953e02a9e43a764c85e687bce0c006d8e30ff9a \
  /usr/lib/python3.11/dataclasses.py
make_prompt licences.txt e6484b84cc5301ad00d0e8d74af636cf327ff5732f826da2852e6c3eeda44c9f \
  "${GPL3}" "${APACHE2}"
readonly L=/usr/share/common-licenses
make_prompt licences-all.txt 24b0c93f72f89c8153029acb8a53ca858b88f247b91207be9531011d27441e82 \
  "${GPL3}" "${APACHE2}" "$L/GPL-2" "$L/LGPL-2.1" "$L/LGPL-2" "$L/LGPL-3" "$L/MPL-2.0" \
  "$L/MPL-1.1" "$L/GFDL-1.3" "$L/GFDL-1.2" "$L/GPL-1" "$L/Artistic" "$L/CC0-1.0" "$L/BSD"
