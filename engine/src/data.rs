//! A byte-level text corpus and deterministic micro-batches for the language model.
//!
//! The built-in corpus is generated in code (no file, nothing copied): a small grammar
//! of English-like sentences (subject-verb agreement, `a`/`an`, irregular plurals and
//! past tenses, relative clauses, questions) sampled with a fixed-seed [`SplitMix64`].
//! It is regular enough for a tiny byte-level LM to learn spelling, spacing and some
//! syntax within a few hundred steps, yet varied enough not to be memorized at once.
//!
//! Tokens are bytes (`vocab = 256`); a micro-batch is `batch` windows of `seq + 1`
//! consecutive bytes at pseudo-random offsets derived from the micro-batch's index,
//! with the corpus treated as circular (a window may wrap from the end to the start).

use std::sync::OnceLock;

use crate::compute::Batch;
use crate::error::{Error, Result};
use crate::model::{mix64, SplitMix64};

/// Seed of the built-in corpus.
pub const BUILTIN_SEED: u64 = 0x5742_A7A0_C0FF_EE01;
/// Minimum size in bytes of the built-in corpus (it stops at the first paragraph end
/// past this).
pub const BUILTIN_BYTES: usize = 96 * 1024;

/// A byte string to sample training windows from (at least 2 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corpus {
    bytes: Vec<u8>,
}

impl Corpus {
    /// The built-in corpus: [`Corpus::generated`] with [`BUILTIN_SEED`] and
    /// [`BUILTIN_BYTES`] (generated once per process, then cloned; about 96 KiB of
    /// ASCII text).
    pub fn builtin() -> Corpus {
        static BUILTIN: OnceLock<Vec<u8>> = OnceLock::new();
        let bytes = BUILTIN.get_or_init(|| generate(BUILTIN_SEED, BUILTIN_BYTES));
        Corpus {
            bytes: bytes.clone(),
        }
    }

    /// A corpus of English-like paragraphs from the built-in grammar, deterministic in
    /// `seed`, at least `min_bytes` long (and at least one paragraph).
    pub fn generated(seed: u64, min_bytes: usize) -> Corpus {
        Corpus {
            bytes: generate(seed, min_bytes),
        }
    }

    /// A corpus of the UTF-8 bytes of `text`. Errors ([`Error::Model`]) if `text` has
    /// fewer than 2 bytes (a token needs a next byte as its target).
    pub fn from_text(text: &str) -> Result<Corpus> {
        Corpus::from_bytes(text.as_bytes().to_vec())
    }

    /// A corpus of arbitrary bytes; errors if fewer than 2.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Corpus> {
        if bytes.len() < 2 {
            return Err(Error::Model(format!(
                "a corpus needs at least 2 bytes (a token and its target), got {}",
                bytes.len()
            )));
        }
        Ok(Corpus { bytes })
    }

    /// The corpus bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Number of bytes (tokens).
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Always false (a corpus has at least 2 bytes); for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Micro-batch number `index`: `batch` rows of `seq` tokens, row-major, with
    /// `targets[i]` the byte after `tokens[i]`. Row `r` starts at the circular offset
    /// `mix64(mix64(index) ^ r) mod len`, so the result depends only on `(seq, batch,
    /// index)` and the corpus; different indices give (almost always) different
    /// windows. The engine uses `index = (step * world + rank) * accum + micro`.
    ///
    /// `seq == 0` or `batch == 0` give an empty batch (which the model rejects).
    pub fn batch(&self, seq: usize, batch: usize, index: u64) -> Batch {
        let len = self.bytes.len();
        let n = seq.saturating_mul(batch);
        let mut tokens = Vec::with_capacity(n.min(1 << 20));
        let mut targets = Vec::with_capacity(n.min(1 << 20));
        if len > 0 {
            let h = mix64(index ^ 0xB47C_0000_0000_0000);
            for r in 0..batch {
                let start = (mix64(h ^ r as u64) % len as u64) as usize;
                for i in 0..seq {
                    let p = (start + i % len) % len;
                    tokens.push(self.bytes[p] as u32);
                    targets.push(self.bytes[(p + 1) % len] as u32);
                }
            }
        }
        Batch {
            tokens,
            targets,
            batch,
            seq,
        }
    }
}

// ---------------------------------------------------------------------------------
// The grammar.

/// (singular, plural)
const NOUNS: &[(&str, &str)] = &[
    ("cat", "cats"),
    ("dog", "dogs"),
    ("child", "children"),
    ("farmer", "farmers"),
    ("baker", "bakers"),
    ("bird", "birds"),
    ("teacher", "teachers"),
    ("horse", "horses"),
    ("fox", "foxes"),
    ("mouse", "mice"),
    ("wolf", "wolves"),
    ("owl", "owls"),
    ("sailor", "sailors"),
    ("painter", "painters"),
    ("miller", "millers"),
    ("goose", "geese"),
    ("woman", "women"),
    ("man", "men"),
    ("engineer", "engineers"),
    ("otter", "otters"),
];

/// Things (objects only).
const THINGS: &[(&str, &str)] = &[
    ("boat", "boats"),
    ("lamp", "lamps"),
    ("letter", "letters"),
    ("stone", "stones"),
    ("window", "windows"),
    ("basket", "baskets"),
    ("apple", "apples"),
    ("key", "keys"),
    ("story", "stories"),
    ("box", "boxes"),
    ("loaf", "loaves"),
    ("umbrella", "umbrellas"),
    ("map", "maps"),
    ("bell", "bells"),
];

/// (base, third person singular, past)
const TRANSITIVE: &[(&str, &str, &str)] = &[
    ("see", "sees", "saw"),
    ("carry", "carries", "carried"),
    ("find", "finds", "found"),
    ("watch", "watches", "watched"),
    ("follow", "follows", "followed"),
    ("paint", "paints", "painted"),
    ("open", "opens", "opened"),
    ("build", "builds", "built"),
    ("read", "reads", "read"),
    ("chase", "chases", "chased"),
    ("help", "helps", "helped"),
    ("hide", "hides", "hid"),
    ("bring", "brings", "brought"),
    ("lose", "loses", "lost"),
    ("mend", "mends", "mended"),
];

const INTRANSITIVE: &[(&str, &str, &str)] = &[
    ("sleep", "sleeps", "slept"),
    ("sing", "sings", "sang"),
    ("wait", "waits", "waited"),
    ("run", "runs", "ran"),
    ("rest", "rests", "rested"),
    ("laugh", "laughs", "laughed"),
    ("work", "works", "worked"),
    ("swim", "swims", "swam"),
    ("listen", "listens", "listened"),
];

const ADJECTIVES: &[&str] = &[
    "small", "old", "quiet", "bright", "green", "heavy", "clever", "tired", "young", "red",
    "gentle", "cold", "early", "honest", "empty", "brave", "little", "orange",
];

const ADVERBS: &[&str] = &[
    "slowly",
    "quietly",
    "again",
    "together",
    "early",
    "often",
    "carefully",
    "happily",
    "all day",
    "at once",
];

const PREPOSITIONS: &[&str] = &[
    "near", "behind", "under", "across", "beside", "above", "inside",
];

const PLACES: &[&str] = &[
    "river", "garden", "bridge", "market", "hill", "mill", "forest", "harbor", "tower", "road",
    "kitchen", "orchard", "station", "island",
];

const NAMES: &[&str] = &[
    "Anna", "Tomas", "Mira", "Oskar", "Lena", "Pavel", "Ines", "Hugo", "Ada",
];

const TIMES: &[&str] = &[
    "In the morning",
    "At night",
    "Every day",
    "After the rain",
    "On Sunday",
    "Before dawn",
    "In winter",
    "Later",
];

const SAYING: &[&str] = &["said", "thought", "knew", "heard", "wrote"];

fn pick<'a, T>(rng: &mut SplitMix64, v: &'a [T]) -> &'a T {
    &v[rng.below(v.len())]
}

fn starts_with_vowel(w: &str) -> bool {
    matches!(w.as_bytes().first(), Some(b'a' | b'e' | b'i' | b'o' | b'u'))
}

/// A noun phrase; returns the text and whether it is plural.
fn noun_phrase(rng: &mut SplitMix64, nouns: &[(&str, &str)]) -> (String, bool) {
    let (sg, pl) = *pick(rng, nouns);
    let plural = rng.below(3) == 0;
    let adj = if rng.below(2) == 0 {
        Some(*pick(rng, ADJECTIVES))
    } else {
        None
    };
    let noun = if plural { pl } else { sg };
    let det = if plural {
        *pick(rng, &["the", "some", "two", "many", "the"])
    } else {
        match rng.below(4) {
            0 | 1 => "the",
            2 => {
                let next = adj.unwrap_or(noun);
                if starts_with_vowel(next) {
                    "an"
                } else {
                    "a"
                }
            }
            _ => *pick(rng, &["every", "this", "that", "one"]),
        }
    };
    let text = match adj {
        Some(a) => format!("{det} {a} {noun}"),
        None => format!("{det} {noun}"),
    };
    (text, plural)
}

fn place(rng: &mut SplitMix64) -> String {
    format!("{} the {}", pick(rng, PREPOSITIONS), pick(rng, PLACES))
}

/// A verb form: present (agreeing with `plural`) or past.
fn verb(v: &(&'static str, &'static str, &'static str), plural: bool, past: bool) -> &'static str {
    let (base, third, past_form) = *v;
    if past {
        past_form
    } else if plural {
        base
    } else {
        third
    }
}

/// One clause: subject, verb, optional object and place.
fn clause(rng: &mut SplitMix64, past: bool) -> String {
    let (subj, plural) = if rng.below(4) == 0 {
        (pick(rng, NAMES).to_string(), false)
    } else {
        noun_phrase(rng, NOUNS)
    };
    if rng.below(3) == 0 {
        let v = verb(pick(rng, INTRANSITIVE), plural, past);
        let tail = if rng.below(2) == 0 {
            pick(rng, ADVERBS).to_string()
        } else {
            place(rng)
        };
        format!("{subj} {v} {tail}")
    } else {
        let v = verb(pick(rng, TRANSITIVE), plural, past);
        let table = if rng.below(2) == 0 { THINGS } else { NOUNS };
        let (obj, _) = noun_phrase(rng, table);
        if rng.below(2) == 0 {
            format!("{subj} {v} {obj} {}", place(rng))
        } else {
            format!("{subj} {v} {obj}")
        }
    }
}

fn sentence(rng: &mut SplitMix64) -> String {
    let past = rng.below(2) == 0;
    let s = match rng.below(8) {
        0 => format!("{}, {}.", pick(rng, TIMES), clause(rng, past)),
        1 => {
            let (subj, _) = noun_phrase(rng, NOUNS);
            let v = pick(rng, TRANSITIVE).0;
            let (obj, _) = noun_phrase(rng, THINGS);
            let aux = if past {
                "Did"
            } else {
                *pick(rng, &["Will", "Can", "Did"])
            };
            format!("{aux} {subj} {v} {obj}?")
        }
        2 => {
            let (subj, plural) = noun_phrase(rng, NOUNS);
            let v = verb(pick(rng, TRANSITIVE), false, true);
            let (obj, _) = noun_phrase(rng, THINGS);
            let be = match (plural, past) {
                (false, false) => "is",
                (true, false) => "are",
                (false, true) => "was",
                (true, true) => "were",
            };
            let rel = if rng.below(2) == 0 { "that" } else { "who" };
            format!("{subj} {rel} {v} {obj} {be} {}.", pick(rng, ADJECTIVES))
        }
        3 => format!(
            "{} {} that {}.",
            pick(rng, NAMES),
            pick(rng, SAYING),
            clause(rng, true)
        ),
        4 => format!("{}, and {}.", clause(rng, past), clause(rng, past)),
        5 => {
            let (a, _) = noun_phrase(rng, NOUNS);
            let (b, _) = noun_phrase(rng, NOUNS);
            let v = verb(pick(rng, INTRANSITIVE), true, past);
            format!("{a} and {b} {v} {}.", pick(rng, ADVERBS))
        }
        _ => format!("{}.", clause(rng, past)),
    };
    capitalize(&s)
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
        None => String::new(),
    }
}

/// Paragraphs of 3 to 6 sentences, one per line, until at least `min_bytes`.
fn generate(seed: u64, min_bytes: usize) -> Vec<u8> {
    let mut rng = SplitMix64::new(mix64(seed));
    let mut out = String::with_capacity(min_bytes.saturating_add(512).min(1 << 26));
    loop {
        let n = 3 + rng.below(4);
        for i in 0..n {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(&sentence(&mut rng));
        }
        out.push('\n');
        if out.len() >= min_bytes {
            break;
        }
    }
    out.into_bytes()
}
