//! A value's contract JSON written straight into a log line: the JSON `serde_json::to_value`
//! gives, with every object key renamed `_` → `-` and each object's keys in byte order (the
//! order of a `serde_json::Map`, which is a B-tree here), and — for the facts — secret-looking
//! values redacted and long strings cut, exactly as the rules of the parent module put them.
//! No `Value` tree is built: the log's writer thread does this for every decision on the cores
//! the decisions run on, and building, renaming and walking trees was most of its CPU.
//!
//! How: values are serialized in place. An object's values are written one after another in
//! the order serde gives them, their keys kept aside; when the object ends its text is written
//! again behind it in key order and moved down over them. A string whose fate depends on its
//! key or on its siblings (a secret-looking key's value; the `value` of a `{key, value}` pair,
//! redacted when the pair's key looks secret) is held back until its object ends. All buffers
//! live in [`Scratch`], kept by the writer from record to record.

use std::ops::Range;

use serde::Serialize;
use serde::ser::{self, Error as _, Impossible};
use serde_json::Error;

use super::{cut_fact, looks_secret, redacted};

/// What a value's JSON had done to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Shaped {
    /// A string was longer than [`FACT_STRING_CUT`](super::FACT_STRING_CUT) and was cut.
    pub cut: bool,
    /// A value looked like a secret and was redacted.
    pub redacted: bool,
}

/// The buffers of the objects being written, reused from value to value (each object takes
/// the tail of each and gives it back when it ends, so nesting is a stack).
#[derive(Default)]
pub(super) struct Scratch {
    entries: Vec<Entry>,
    /// The renamed keys of the entries.
    keys: String,
    /// The held-back strings.
    held: String,
}

/// One entry of an object being written.
struct Entry {
    /// The renamed key, in `Scratch::keys`.
    key: Range<usize>,
    /// The key as serde gave it, in `Scratch::keys` (the same range when it held no `_`).
    original: Range<usize>,
    value: Placed,
}

enum Placed {
    /// The value's JSON, in the output.
    Written(Range<usize>),
    /// A string held back, in `Scratch::held`.
    Held(Range<usize>),
}

/// Appends the contract JSON of `value` to `out`. With `facts`, secrets are redacted and long
/// strings cut (the facts of a record); without, the JSON is only renamed and ordered (the
/// decision). On an error `out` may hold part of the value: the caller drops the line.
pub(super) fn write_contract_json<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    scratch: &mut Scratch,
    value: &T,
    facts: bool,
) -> Result<Shaped, Error> {
    let mut writer = Writer {
        out,
        scratch,
        facts,
        shaped: Shaped::default(),
    };
    value.serialize(ValueSer {
        w: &mut writer,
        key: None,
    })?;
    Ok(writer.shaped)
}

struct Writer<'a> {
    out: &'a mut Vec<u8>,
    scratch: &'a mut Scratch,
    facts: bool,
    shaped: Shaped,
}

/// An entry's key kept aside: renamed, and as serde gave it.
#[derive(Clone)]
struct Key {
    renamed: Range<usize>,
    original: Range<usize>,
}

/// Where an object's own buffers start.
struct Frame {
    body: usize,
    entries: usize,
    keys: usize,
    held: usize,
}

impl Writer<'_> {
    fn open(&self) -> Frame {
        Frame {
            body: self.out.len(),
            entries: self.scratch.entries.len(),
            keys: self.scratch.keys.len(),
            held: self.scratch.held.len(),
        }
    }

    /// Keeps `key` aside, renamed to the contract's form.
    fn push_key(&mut self, key: &str) -> Key {
        let keys = &mut self.scratch.keys;
        let start = keys.len();
        push_renamed(keys, key);
        let renamed = start..keys.len();
        let original = if key.contains('_') {
            keys.push_str(key);
            renamed.end..keys.len()
        } else {
            renamed.clone()
        };
        Key { renamed, original }
    }

    /// Records the entry whose value was written from `value_start` on (or held).
    fn push_entry(&mut self, key: Key, value_start: usize, held: Option<Range<usize>>) {
        let value = match held {
            Some(held) => Placed::Held(held),
            None => Placed::Written(value_start..self.out.len()),
        };
        self.scratch.entries.push(Entry {
            key: key.renamed,
            original: key.original,
            value,
        });
    }

    /// A string value: held back when its key could make it a secret, else written.
    fn string(&mut self, key: Option<&Key>, text: &str) -> Option<Range<usize>> {
        if let Some(key) = key.filter(|_| self.facts) {
            let name = &self.scratch.keys[key.renamed.clone()];
            // `key` itself looks secret, so both halves of a pair are held.
            if name == "value" || looks_secret(name) {
                let held = &mut self.scratch.held;
                let start = held.len();
                held.push_str(text);
                return Some(start..held.len());
            }
        }
        write_cut(self.out, self.facts, &mut self.shaped, text);
        None
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    fn json<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        serde_json::to_writer(&mut *self.out, value)
    }

    /// Ends the object opened at `frame`: writes it in key order, redacting and cutting its
    /// held strings, over its values. Of entries whose keys are one after renaming the last
    /// wins, as in the tree this replaces: a map (the last of equal keys), renamed key by key in
    /// the order of the keys as given (so the greatest of `a_b` and `a-b`).
    fn close(&mut self, frame: Frame) -> Result<(), Error> {
        let Scratch { entries, keys, held } = &mut *self.scratch;
        let list = &mut entries[frame.entries..];
        // Stable: of equal keys the one serialized last stays last.
        list.sort_by(|a, b| {
            keys[a.key.clone()]
                .cmp(&keys[b.key.clone()])
                .then_with(|| keys[a.original.clone()].cmp(&keys[b.original.clone()]))
        });
        let key_of = |e: &Entry| &keys[e.key.clone()];
        let kept = |i: usize| i + 1 == list.len() || key_of(&list[i]) != key_of(&list[i + 1]);
        let count = (0..list.len()).filter(|&i| kept(i)).count();
        // The redaction rule's `{key, value}` pair: exactly those two keys, both strings.
        let pair_key = if self.facts && count == 2 {
            let mut found = (None, false);
            for (i, entry) in list.iter().enumerate().filter(|(i, _)| kept(*i)) {
                match (key_of(entry), &entry.value) {
                    ("key", Placed::Held(_)) => found.0 = Some(i),
                    ("value", Placed::Held(_)) => found.1 = true,
                    _ => {}
                }
            }
            match found {
                (Some(i), true) => match &list[i].value {
                    Placed::Held(text) => Some(&held[text.clone()]),
                    Placed::Written(_) => None,
                },
                _ => None,
            }
        } else {
            None
        };
        let start = self.out.len();
        self.out.push(b'{');
        let mut first = true;
        for (i, entry) in list.iter().enumerate() {
            if !kept(i) {
                continue;
            }
            if !first {
                self.out.push(b',');
            }
            first = false;
            let name = key_of(entry);
            serde_json::to_writer(&mut *self.out, name)?;
            self.out.push(b':');
            match &entry.value {
                Placed::Written(range) => self.out.extend_from_within(range.clone()),
                Placed::Held(range) => {
                    let text = &held[range.clone()];
                    let secret = match pair_key {
                        Some(pair_key) => name == "value" && looks_secret(pair_key),
                        None => looks_secret(name),
                    };
                    if secret {
                        serde_json::to_writer(&mut *self.out, &redacted(text))?;
                        self.shaped.redacted = true;
                    } else {
                        write_cut(self.out, self.facts, &mut self.shaped, text);
                    }
                }
            }
        }
        self.out.push(b'}');
        let len = self.out.len() - start;
        self.out.copy_within(start.., frame.body);
        self.out.truncate(frame.body + len);
        entries.truncate(frame.entries);
        keys.truncate(frame.keys);
        held.truncate(frame.held);
        Ok(())
    }
}

/// `key` with every `_` made `-` (WIT identifiers never hold `_`).
fn push_renamed(keys: &mut String, key: &str) {
    for (i, part) in key.split('_').enumerate() {
        if i > 0 {
            keys.push('-');
        }
        keys.push_str(part);
    }
}

/// Writes `text` as a JSON string, cut (at a char boundary) and marked when it is a fact longer
/// than [`FACT_STRING_CUT`](super::FACT_STRING_CUT) bytes.
fn write_cut(out: &mut Vec<u8>, facts: bool, shaped: &mut Shaped, text: &str) {
    match facts.then(|| cut_fact(text)).flatten() {
        Some(kept) => {
            serde_json::to_writer(&mut *out, &kept).expect("a string serializes into memory");
            shaped.cut = true;
        }
        None => serde_json::to_writer(&mut *out, text).expect("a string serializes into memory"),
    }
}

/// Serializes one value into the line; `key` is its key when it is an object's entry (a string
/// there may be held back). Answers the held string's place, if it was held.
struct ValueSer<'s, 'a> {
    w: &'s mut Writer<'a>,
    key: Option<Key>,
}

type Held = Option<Range<usize>>;

impl<'s, 'a> ser::Serializer for ValueSer<'s, 'a> {
    type Ok = Held;
    type Error = Error;
    type SerializeSeq = SeqSer<'s, 'a>;
    type SerializeTuple = SeqSer<'s, 'a>;
    type SerializeTupleStruct = SeqSer<'s, 'a>;
    type SerializeTupleVariant = VariantSeqSer<'s, 'a>;
    type SerializeMap = MapSer<'s, 'a>;
    type SerializeStruct = MapSer<'s, 'a>;
    type SerializeStructVariant = VariantMapSer<'s, 'a>;

    fn serialize_bool(self, v: bool) -> Result<Held, Error> {
        self.w.raw(if v { b"true" } else { b"false" });
        Ok(None)
    }
    fn serialize_i8(self, v: i8) -> Result<Held, Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<Held, Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<Held, Error> {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<Held, Error> {
        self.w.json(&v)?;
        Ok(None)
    }
    fn serialize_i128(self, v: i128) -> Result<Held, Error> {
        // As `Value` holds it: a number only within 64 bits.
        if let Ok(v) = u64::try_from(v) {
            self.serialize_u64(v)
        } else if let Ok(v) = i64::try_from(v) {
            self.serialize_i64(v)
        } else {
            Err(Error::custom("number out of range"))
        }
    }
    fn serialize_u8(self, v: u8) -> Result<Held, Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result<Held, Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result<Held, Error> {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result<Held, Error> {
        self.w.json(&v)?;
        Ok(None)
    }
    fn serialize_u128(self, v: u128) -> Result<Held, Error> {
        match u64::try_from(v) {
            Ok(v) => self.serialize_u64(v),
            Err(_) => Err(Error::custom("number out of range")),
        }
    }
    fn serialize_f32(self, v: f32) -> Result<Held, Error> {
        // Through `Value`, whose number (or null) it is there.
        self.w.json(&serde_json::Value::from(v))?;
        Ok(None)
    }
    fn serialize_f64(self, v: f64) -> Result<Held, Error> {
        self.w.json(&serde_json::Value::from(v))?;
        Ok(None)
    }
    fn serialize_char(self, v: char) -> Result<Held, Error> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<Held, Error> {
        Ok(self.w.string(self.key.as_ref(), v))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Held, Error> {
        let mut seq = ser::Serializer::serialize_seq(self, Some(v.len()))?;
        for b in v {
            ser::SerializeSeq::serialize_element(&mut seq, b)?;
        }
        ser::SerializeSeq::end(seq)
    }
    fn serialize_none(self) -> Result<Held, Error> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Held, Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Held, Error> {
        self.w.raw(b"null");
        Ok(None)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<Held, Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Result<Held, Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<Held, Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Held, Error> {
        // A one-key object, `{Variant: value}`, under the same rules as any other.
        let w = self.w;
        let outer = w.open();
        let key = w.push_key(variant);
        let start = w.out.len();
        let held = value.serialize(ValueSer {
            w: &mut *w,
            key: Some(key.clone()),
        })?;
        w.push_entry(key, start, held);
        w.close(outer)?;
        Ok(None)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<SeqSer<'s, 'a>, Error> {
        self.w.raw(b"[");
        Ok(SeqSer { w: self.w, first: true })
    }
    fn serialize_tuple(self, len: usize) -> Result<SeqSer<'s, 'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<SeqSer<'s, 'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<VariantSeqSer<'s, 'a>, Error> {
        let w = self.w;
        let outer = w.open();
        let key = w.push_key(variant);
        let start = w.out.len();
        w.raw(b"[");
        Ok(VariantSeqSer {
            seq: SeqSer { w, first: true },
            outer,
            key,
            start,
        })
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<MapSer<'s, 'a>, Error> {
        let frame = self.w.open();
        Ok(MapSer {
            w: self.w,
            frame,
            key: None,
        })
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<MapSer<'s, 'a>, Error> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<VariantMapSer<'s, 'a>, Error> {
        let w = self.w;
        let outer = w.open();
        let key = w.push_key(variant);
        let start = w.out.len();
        let frame = w.open();
        Ok(VariantMapSer {
            map: MapSer { w, frame, key: None },
            outer,
            key,
            start,
        })
    }
}

/// An array's elements.
struct SeqSer<'s, 'a> {
    w: &'s mut Writer<'a>,
    first: bool,
}

impl SeqSer<'_, '_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if !self.first {
            self.w.raw(b",");
        }
        self.first = false;
        value.serialize(ValueSer {
            w: &mut *self.w,
            key: None,
        })?;
        Ok(())
    }

    fn finish(self) -> Result<Held, Error> {
        self.w.raw(b"]");
        Ok(None)
    }
}

impl ser::SerializeSeq for SeqSer<'_, '_> {
    type Ok = Held;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<Held, Error> {
        self.finish()
    }
}

impl ser::SerializeTuple for SeqSer<'_, '_> {
    type Ok = Held;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<Held, Error> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for SeqSer<'_, '_> {
    type Ok = Held;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<Held, Error> {
        self.finish()
    }
}

/// `{Variant: [elements]}`.
struct VariantSeqSer<'s, 'a> {
    seq: SeqSer<'s, 'a>,
    outer: Frame,
    key: Key,
    start: usize,
}

impl ser::SerializeTupleVariant for VariantSeqSer<'_, '_> {
    type Ok = Held;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.seq.element(value)
    }
    fn end(self) -> Result<Held, Error> {
        let VariantSeqSer { seq, outer, key, start } = self;
        let w = seq.w;
        w.raw(b"]");
        w.push_entry(key, start, None);
        w.close(outer)?;
        Ok(None)
    }
}

/// An object's entries (a struct's fields or a map's pairs).
struct MapSer<'s, 'a> {
    w: &'s mut Writer<'a>,
    frame: Frame,
    /// A map's key, until its value comes.
    key: Option<Key>,
}

impl MapSer<'_, '_> {
    fn entry<T: Serialize + ?Sized>(&mut self, key: Key, value: &T) -> Result<(), Error> {
        let start = self.w.out.len();
        let held = value.serialize(ValueSer {
            w: &mut *self.w,
            key: Some(key.clone()),
        })?;
        self.w.push_entry(key, start, held);
        Ok(())
    }
}

impl ser::SerializeMap for MapSer<'_, '_> {
    type Ok = Held;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        // As given first (a number, say, becomes its text), then renamed behind it.
        let keys = &mut self.w.scratch.keys;
        let start = keys.len();
        key.serialize(KeySer { keys: &mut *keys })?;
        let original = start..keys.len();
        let renamed = if keys[original.clone()].contains('_') {
            let given = keys[original.clone()].to_string();
            push_renamed(keys, &given);
            original.end..keys.len()
        } else {
            original.clone()
        };
        self.key = Some(Key { renamed, original });
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| Error::custom("a map's value came before its key"))?;
        self.entry(key, value)
    }
    fn end(self) -> Result<Held, Error> {
        self.w.close(self.frame)?;
        Ok(None)
    }
}

impl ser::SerializeStruct for MapSer<'_, '_> {
    type Ok = Held;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Error> {
        let key = self.w.push_key(key);
        self.entry(key, value)
    }
    fn end(self) -> Result<Held, Error> {
        ser::SerializeMap::end(self)
    }
}

/// `{Variant: {fields}}`.
struct VariantMapSer<'s, 'a> {
    map: MapSer<'s, 'a>,
    outer: Frame,
    key: Key,
    start: usize,
}

impl ser::SerializeStructVariant for VariantMapSer<'_, '_> {
    type Ok = Held;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Error> {
        ser::SerializeStruct::serialize_field(&mut self.map, key, value)
    }
    fn end(self) -> Result<Held, Error> {
        let VariantMapSer { map, outer, key, start } = self;
        let w = map.w;
        w.close(map.frame)?;
        w.push_entry(key, start, None);
        w.close(outer)?;
        Ok(None)
    }
}

/// A map's key as text, into the keys kept aside: strings and what `serde_json` turns into
/// one (numbers, booleans, unit variants); anything else is an error, as in `serde_json`.
struct KeySer<'k> {
    keys: &'k mut String,
}

fn key_must_be_a_string() -> Error {
    Error::custom("key must be a string")
}

impl KeySer<'_> {
    fn display(self, v: impl std::fmt::Display) -> Result<(), Error> {
        use std::fmt::Write as _;
        write!(self.keys, "{v}").map_err(Error::custom)
    }
}

impl ser::Serializer for KeySer<'_> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Impossible<(), Error>;
    type SerializeTuple = Impossible<(), Error>;
    type SerializeTupleStruct = Impossible<(), Error>;
    type SerializeTupleVariant = Impossible<(), Error>;
    type SerializeMap = Impossible<(), Error>;
    type SerializeStruct = Impossible<(), Error>;
    type SerializeStructVariant = Impossible<(), Error>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        self.display(v)
    }
    fn serialize_f32(self, _v: f32) -> Result<(), Error> {
        // The contract's types are `Eq`: they hold no floats.
        Err(Error::custom("a float map key is not logged"))
    }
    fn serialize_f64(self, _v: f64) -> Result<(), Error> {
        Err(Error::custom("a float map key is not logged"))
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.keys.push_str(v);
        Ok(())
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_none(self) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit(self) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Result<(), Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Impossible<(), Error>, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Impossible<(), Error>, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Impossible<(), Error>, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Impossible<(), Error>, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Impossible<(), Error>, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Impossible<(), Error>, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Impossible<(), Error>, Error> {
        Err(key_must_be_a_string())
    }
}

#[cfg(test)]
impl Scratch {
    /// Whether every object gave its buffers back.
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.keys.is_empty() && self.held.is_empty()
    }
}
