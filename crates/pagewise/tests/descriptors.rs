//! The descriptors pagewise keeps open are the program's to close: a
//! program that closes every descriptor it did not open (a daemon at
//! start, `closefrom(3)`) and opens files of its own, which take the
//! lowest free numbers, must find nothing of pagewise's in them. Here the
//! sample file of `pagewise run` (`PAGEWISE_SAMPLE_FILE`, a line every few
//! milliseconds); meshing's memory files are in `tests/mesh_global.rs`.
#![cfg(target_os = "linux")]

#[global_allocator]
static A: pagewise::Pagewise = pagewise::Pagewise;

mod reexec;

const CHILD: &str = "PAGEWISE_TEST_DESCRIPTORS_CHILD";
const VICTIM: usize = 4096;

/// Descriptors of this process whose target names `what`.
fn descriptors_of(what: &str) -> Vec<i32> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().contains(what)))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Runs in the child only: closes every descriptor above stderr, opens
/// files until one holds each number the sample file had, lets the
/// sampler run, and says how many of its files kept their bytes.
#[test]
fn child_entry() {
    let Ok(dir) = std::env::var(CHILD) else {
        return;
    };
    let ours = descriptors_of("samples");
    assert!(!ours.is_empty(), "no sample file open");
    // SAFETY: plain system call; nothing above stderr is needed here.
    let closed = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    assert_eq!(closed, 0, "close_range");
    let highest = *ours.iter().max().unwrap();
    let mut files = Vec::new();
    use std::os::fd::AsRawFd;
    while files
        .last()
        .is_none_or(|f: &std::fs::File| f.as_raw_fd() < highest)
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(format!("{dir}/victim-{}", files.len()))
            .unwrap();
        std::io::Write::write_all(&mut &f, &[0x5a; VICTIM]).unwrap();
        files.push(f);
    }
    // Some 20 sampling periods, the heap in use meanwhile.
    for _ in 0..20 {
        let v: Vec<Box<[u8]>> = (0..1000)
            .map(|_| vec![1u8; 64].into_boxed_slice())
            .collect();
        drop(v);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let untouched = files
        .iter()
        .filter(|f| {
            let mut buf = Vec::new();
            std::io::Seek::seek(&mut &**f, std::io::SeekFrom::Start(0)).unwrap();
            std::io::Read::read_to_end(&mut &**f, &mut buf).unwrap();
            buf.len() == VICTIM && buf.iter().all(|&b| b == 0x5a)
        })
        .count();
    println!("descriptors-report {} {untouched}", files.len());
}

#[test]
fn closing_the_sample_files_descriptor_and_opening_files_in_its_place_gets_no_sample_in_them() {
    let dir = std::env::temp_dir().join(format!("pagewise-descriptors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let samples = dir.join("samples");
    let mut cmd = reexec::this_binary();
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, &dir)
        .env("PAGEWISE_SAMPLE_FILE", &samples)
        .env("PAGEWISE_SAMPLE_MS", "5");
    let out = reexec::output_within(cmd, std::time::Duration::from_secs(300));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("descriptors-report ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report:\n{stdout}\n{stderr}"));
    let f: Vec<usize> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    let lines = std::fs::read_to_string(&samples).unwrap().lines().count();
    std::fs::remove_dir_all(&dir).unwrap();
    eprintln!("{} files opened in its place; {lines} samples before", f[0]);
    assert!(lines >= 1, "the sampler wrote nothing before");
    assert_eq!(f[1], f[0], "samples written into the program's files");
    assert!(
        stderr.contains("pagewise: the program closed or replaced a file descriptor"),
        "{stderr}"
    );
}
