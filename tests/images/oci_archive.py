#!/usr/bin/env python3
"""Writes an OCI image archive (oci-layout, index.json, blobs) from a
rootfs directory, for `ctr images import` — no registry, stdlib only.

usage: oci_archive.py ROOTFS OUT.tar REF [ENTRYPOINT...]

One gzip layer with the rootfs (owners root, modes kept, symlinks kept),
an image config (linux/amd64, PATH=/bin), a manifest, and an index whose
manifest carries the org.opencontainers.image.ref.name annotation that
`ctr images import` names the image by (REF, e.g. docker.io/library/x:1).
"""
import gzip, hashlib, io, json, os, sys, tarfile, time

def blob(data):
    return "sha256:" + hashlib.sha256(data).hexdigest(), data

def layer(rootfs):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                path = os.path.join(dirpath, name)
                info = tar.gettarinfo(path, os.path.relpath(path, rootfs))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    gz = gzip.compress(raw.getvalue(), mtime=0)
    return diff_id, gz

def main():
    rootfs, out, ref = sys.argv[1], sys.argv[2], sys.argv[3]
    entry = sys.argv[4:] or ["/bin/sh"]
    diff_id, gz = layer(rootfs)
    layer_digest, layer_data = blob(gz)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": entry},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }, sort_keys=True).encode()
    config_digest, config_data = blob(config)
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config_data)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest, "size": len(layer_data)}],
    }, sort_keys=True).encode()
    manifest_digest, manifest_data = blob(manifest)
    index = json.dumps({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": manifest_digest, "size": len(manifest_data),
                       "annotations": {"org.opencontainers.image.ref.name": ref}}],
    }, sort_keys=True).encode()
    with tarfile.open(out, "w") as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), int(time.time())
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index)
        for digest, data in [(layer_digest, layer_data), (config_digest, config_data),
                             (manifest_digest, manifest_data)]:
            add("blobs/sha256/" + digest.split(":")[1], data)

if __name__ == "__main__":
    main()
