#!/usr/bin/env bash
# Writes the long-document corpus of cf-textcls / cf-approx --data-file: every
# chapter of the King James Bible (Debian packages bible-kjv and bible-kjv-text,
# read through their `bible` program), one chapter per line, labelled by the
# traditional group of its book (8 groups, 1,189 chapters; a chapter averages
# about 3,600 characters, so texts run to N = 1,024-4,096 and beyond):
#
#   scripts/bible_corpus.sh OUT.tsv        # label<TAB>text lines (nn/data/labelled_text.h)
#
# Verse numbers are dropped and the verses of a chapter joined by spaces. The
# file is written next to OUT and renamed into place, so a failed run leaves no
# half file. Exit status: 0 done, 1 `bible` missing or failing, 2 bad usage.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: scripts/bible_corpus.sh OUT.tsv" >&2
  exit 2
fi
out="$1"
if ! command -v bible > /dev/null; then
  echo "bible_corpus: the 'bible' program is missing (Debian package bible-kjv; scripts/setup.sh installs it)" >&2
  exit 1
fi

# Group: book:chapters ... (the Protestant canon's usual division).
groups=(
  "law|Genesis:50 Exodus:40 Leviticus:27 Numbers:36 Deuteronomy:34"
  "history|Joshua:24 Judges:21 Ruth:4 1Samuel:31 2Samuel:24 1Kings:22 2Kings:25 1Chronicles:29 2Chronicles:36 Ezra:10 Nehemiah:13 Esther:10"
  "wisdom|Job:42 Psalms:150 Proverbs:31 Ecclesiastes:12 Song:8"
  "major-prophets|Isaiah:66 Jeremiah:52 Lamentations:5 Ezekiel:48 Daniel:12"
  "minor-prophets|Hosea:14 Joel:3 Amos:9 Obadiah:1 Jonah:4 Micah:7 Nahum:3 Habakkuk:3 Zephaniah:3 Haggai:2 Zechariah:14 Malachi:4"
  "gospels-acts|Matthew:28 Mark:16 Luke:24 John:21 Acts:28"
  "pauline-epistles|Romans:16 1Corinthians:16 2Corinthians:13 Galatians:6 Ephesians:6 Philippians:4 Colossians:4 1Thessalonians:5 2Thessalonians:3 1Timothy:6 2Timothy:4 Titus:3 Philemon:1"
  "general-epistles-revelation|Hebrews:13 James:5 1Peter:5 2Peter:3 1John:5 2John:1 3John:1 Jude:1 Revelation:22"
)

tmp="$(mktemp "$(dirname "$out")/.bible_corpus.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
chapters=0
for entry in "${groups[@]}"; do
  label="${entry%%|*}"
  for book in ${entry#*|}; do
    name="${book%%:*}"
    for ((c = 1; c <= ${book##*:}; ++c)); do
      # Verse lines start with spaces and the verse number, their continuations
      # with text; the heading before the first verse ("Genesis 1") names the book,
      # which is the answer, so everything before the first verse is dropped.
      text="$(bible "${name}${c}:1-999" | awk '/^ +[0-9]+ / { verses = 1 } verses' |
        sed -E 's/^[[:space:]]+[0-9]+ //' | tr '\t\n' '  ' | tr -s ' ' | sed -E 's/^ //; s/ $//')"
      if [ -z "$text" ]; then
        echo "bible_corpus: 'bible ${name}${c}:1-999' printed no text" >&2
        exit 1
      fi
      printf '%s\t%s\n' "$label" "${text//\\/\\\\}" >> "$tmp"
      chapters=$((chapters + 1))
    done
  done
done
mv "$tmp" "$out"
trap - EXIT
echo "bible_corpus: wrote $chapters chapters to $out" >&2
