//! pprof's `profile.proto`, gzipped: what `go tool pprof` and other pprof
//! viewers open with no pagewise code. The messages are declared here with
//! `prost`'s derive (the field numbers of google/pprof's
//! `proto/profile.proto`), so no build script or `protoc` is needed; the
//! values are those of Go's heap profiles (`inuse_space` is the default
//! sample type; `peak_*` are pagewise's own, the in-use figures when the
//! process's committed memory was highest).

use super::symbols::Symbolizer;
use super::Profile;
use std::collections::HashMap;
use std::io::Write;

#[derive(Clone, PartialEq, prost::Message)]
pub struct PProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<PSample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<PMapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PSample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PMapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// Builds the pprof profile (symbolized, allocator frames left out).
pub fn build(p: &Profile, sym: &mut Symbolizer<'_>) -> PProfile {
    let mut strings: Vec<String> = vec![String::new()];
    let mut string_ids: HashMap<String, i64> = HashMap::new();
    let mut s = |text: &str| -> i64 {
        if let Some(&id) = string_ids.get(text) {
            return id;
        }
        strings.push(text.to_string());
        let id = strings.len() as i64 - 1;
        string_ids.insert(text.to_string(), id);
        id
    };
    let types = [
        "inuse_objects",
        "inuse_space",
        "peak_objects",
        "peak_space",
        "alloc_objects",
        "alloc_space",
    ];
    let sample_type = types
        .iter()
        .map(|t| ValueType {
            r#type: s(t),
            unit: s(if t.ends_with("objects") {
                "count"
            } else {
                "bytes"
            }),
        })
        .collect();
    let mapping: Vec<PMapping> = p
        .mappings
        .iter()
        .filter(|m| m.executable)
        .enumerate()
        .map(|(i, m)| PMapping {
            id: i as u64 + 1,
            memory_start: m.start,
            memory_limit: m.end,
            file_offset: m.offset,
            filename: s(&m.path),
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        })
        .collect();
    let mut functions: Vec<Function> = Vec::new();
    let mut function_ids: HashMap<(String, String), u64> = HashMap::new();
    let mut locations: Vec<Location> = Vec::new();
    let mut location_ids: HashMap<u64, u64> = HashMap::new();
    let mut samples = Vec::new();
    for site in &p.sites {
        let stack = sym.stack(&site.frames);
        let mut ids: Vec<u64> = Vec::new();
        // Innermost first, one location per address (its inline frames
        // as its lines, innermost first).
        let mut by_address: Vec<(u64, Vec<&super::symbols::Frame>)> = Vec::new();
        for f in stack.iter().rev() {
            match by_address.last_mut() {
                Some((a, v)) if *a == f.address => v.push(f),
                _ => by_address.push((f.address, vec![f])),
            }
        }
        for (address, frames) in by_address {
            let id = *location_ids.entry(address).or_insert_with(|| {
                let lines = frames
                    .iter()
                    .map(|f| {
                        let (file, line) = match &f.location {
                            Some(l) => match l.rsplit_once(':') {
                                Some((file, n)) => (file.to_string(), n.parse().unwrap_or(0)),
                                None => (l.clone(), 0),
                            },
                            None => (String::new(), 0),
                        };
                        let key = (f.function.clone(), file.clone());
                        let function_id = *function_ids.entry(key).or_insert_with(|| {
                            let id = functions.len() as u64 + 1;
                            functions.push(Function {
                                id,
                                name: s(&f.function),
                                system_name: s(&f.function),
                                filename: s(&file),
                            });
                            id
                        });
                        Line { function_id, line }
                    })
                    .collect();
                let mapping_id = mapping
                    .iter()
                    .find(|m| m.memory_start <= address && address < m.memory_limit)
                    .map_or(0, |m| m.id);
                let id = locations.len() as u64 + 1;
                locations.push(Location {
                    id,
                    mapping_id,
                    address,
                    line: lines,
                });
                id
            });
            ids.push(id);
        }
        let v = |f: super::Figures| [f.count as i64, f.bytes as i64];
        let value = [v(site.live), v(site.peak), v(site.allocated)].concat();
        samples.push(PSample {
            location_id: ids,
            value,
        });
    }
    let period_type = Some(ValueType {
        r#type: s("space"),
        unit: s("bytes"),
    });
    let default_sample_type = s("inuse_space");
    PProfile {
        sample_type,
        sample: samples,
        mapping,
        location: locations,
        function: functions,
        string_table: strings,
        period_type,
        period: p.sample_bytes as i64,
        default_sample_type,
    }
}

/// Writes `profile` gzipped to `path`.
pub fn write(profile: &PProfile, path: &std::path::Path) -> std::io::Result<()> {
    use prost::Message;
    let file = std::fs::File::create(path)?;
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?;
    Ok(())
}
