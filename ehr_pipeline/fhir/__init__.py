"""FHIR R4 in and out: code systems and tables (codes), Bundle -> model events (mapping), MIMIC -> Bundle (convert).

Validation uses the pinned ``fhir.resources`` models of FHIR R4B (4.3), the R4 line's
technical correction: the resources read and written here are unchanged from R4 (4.0.1).
"""
